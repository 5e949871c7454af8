"""Concurrent requests: several sequences decoded together in one context, and what speculation gains there."""
