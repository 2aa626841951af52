"""Modules the tests share: test envs, pinned references, fault-run drivers and curricula cases (imported as
`helpers.NAME`; child processes find them with tests/ on PYTHONPATH)."""
