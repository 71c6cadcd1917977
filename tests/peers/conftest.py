"""Tests of the peers: the field's own implementations run as methods."""
