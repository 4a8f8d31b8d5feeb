"""Importable test helpers (``from tests.helpers.checkpoints import ...``): shared code lives here, not in conftest."""
