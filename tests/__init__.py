"""nbqueue's test suite; a package so that `from tests.helpers import ...` works from every folder."""
