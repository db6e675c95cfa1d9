"""The run API: ``ragpool`` verbs over HTTP, as the caller's IAM identity (server.py), its client and the
laptop's contexts (client.py, contexts.py, cli.py). Torch-free."""
