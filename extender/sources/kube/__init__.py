"""Talking to the Kubernetes API server: where it is and who we are (`config`), requests and watches (`client`)."""
