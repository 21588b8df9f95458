"""Compatibility with other replay-buffer libraries: reading what they wrote, speaking their API."""
