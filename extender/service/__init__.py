"""One process's HTTP surface: the verbs, the pages for people and probes, the transport, TLS and metrics."""
