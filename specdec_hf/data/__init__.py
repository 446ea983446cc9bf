"""Offline corpora for the demo verifier and the drafter (built from Debian packages; see `debian_corpus`)."""
