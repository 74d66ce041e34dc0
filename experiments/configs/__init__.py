"""Config files: each ``get_config()`` returns an ``ml_collections.ConfigDict``."""
