"""The HTTP API's route groups, one module per resource (docs/architecture.md §8), and what they
share: the app context (``context``), the request and answer helpers (``http``), the app-wide error
answers (``errors``), authentication (``auth``) and pagination (``pagination``).

``notifier.ingest.app.create_app`` mounts them.
"""
