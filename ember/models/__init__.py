"""Models built with ember.nn."""
