"""Test helpers shared by several test modules."""
