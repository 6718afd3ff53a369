"""Suite-wide rules, as plugins (each module's docstring says what it checks):

- tests/spawn_guard.py: a test that starts the trainer carries the `slow` marker.
- tests/checkout_guard.py: no test creates or changes files in the checkout's own
  output/, cache/, .aitk-ui/ or logs/.

The tiers are described in docs/testing.md.
"""

pytest_plugins = ["pytester", "tests.spawn_guard", "tests.checkout_guard"]
