"""Test support shipped with the package: tiny random checkpoints (``tiny.py``) that fixtures build.

Nothing here is imported by the plugin at serving time.
"""
