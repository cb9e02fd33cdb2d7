"""Agent frameworks on nbqueue, each an optional extra: `nbqueue.integrations.langgraph`
(pip install 'nbqueue[langgraph]')."""
