"""Deployment template sources (``python -m infra.merge_template``)."""
