"""The operator's web console (``provisioner console``, the ``[console]`` extra)."""
