"""The bundled configs and the data they read (``aisim.configs``; see README "Bundled configs")."""
