"""Agent frameworks on nbqueue, each an optional extra: `nbqueue.integrations.langgraph`
(pip install 'nbqueue[langgraph]') and `nbqueue.integrations.pydantic_ai`
(pip install 'nbqueue[pydantic-ai]')."""
