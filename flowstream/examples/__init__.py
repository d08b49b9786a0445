"""Example workflows: the demo's order workflow, also served by ``flowstream worker``."""
