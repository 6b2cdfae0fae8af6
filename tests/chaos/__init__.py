"""The chaos suite: seeded ASHA searches on the embedded cluster under injected faults."""
