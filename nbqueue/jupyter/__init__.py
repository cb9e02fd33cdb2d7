"""The notebook front end: magics, views and DataFrames.

The only package that imports IPython, ipywidgets and pandas, and only when used,
so `import nbqueue` in a plain worker process stays light.
"""
