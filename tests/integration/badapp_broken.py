"""An application module that fails while importing (tests/integration/test_app_loading.py)."""

raise RuntimeError("the application's own import-time bug")
