"""The model test's reference model and database helpers (tests/test_state_model.py)."""
