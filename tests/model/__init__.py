"""The model test (tests/db/test_state_model.py): its rules, reference model and database
helpers."""
