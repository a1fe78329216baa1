"""notifier's benchmark: every stage of the pipeline measured against a baseline run in the same
invocation (``just bench``, or ``python -m bench``; see bench/README.md)."""
