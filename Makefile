# Two commands matter: `make test` and `make demo`. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo lint typecheck unit bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,web,history,archive]'
	# experta 1.9.4 pins frozendict==1.2, which fails to import on Python >= 3.10.
	# Its real needs (frozendict>=2.4, schema>=0.7) come with the dev extras above.
	$(BIN)/python -m pip install --quiet --no-deps experta==1.9.4
	touch $(STAMP)

test: lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy padres rete historic web spark tests scenarios

unit: $(STAMP)
	$(BIN)/pytest -q -n 2 --dist loadfile

# The full real data set when it is beside the checkout, else the sample shipped in the package.
STOCKQUOTES ?= $(firstword $(wildcard ../shared/data/stockquotes) padres/data/stockquotes-sample.txt)
DEMO_SUBS := scenarios/stocks/subscriptions.txt

demo: $(STAMP)
	@echo "== The demo subscriptions, checked and normalized by 'padres parse'"
	$(BIN)/padres parse $(DEMO_SUBS)
	@echo
	@echo "== Every quote of $(STOCKQUOTES) matched against them, by the Rete engine"
	$(BIN)/padres match --subs $(DEMO_SUBS) --pubs $(STOCKQUOTES) --summary --engine rete
	@echo
	@echo "== The same by the reference matcher, which evaluates every subscription in turn"
	$(BIN)/padres match --subs $(DEMO_SUBS) --pubs $(STOCKQUOTES) --summary --engine naive
	@echo
	@echo "== The first composite matches, with the publications that completed them"
	$(BIN)/padres match --subs $(DEMO_SUBS) --pubs $(STOCKQUOTES) --only-matches --engine rete \
		| grep -m 3 's6\['
	@echo
	@echo "== PADRES' demo star: five broker processes on loopback, quotes published at A"
	$(BIN)/python scenarios/stocks/overlay.py $(STOCKQUOTES)
	@echo
	@echo "== The retail day: four brokers in a cycle, two databases, a sales manager's"
	@echo "   future, historic, hybrid and composite subscriptions"
	$(BIN)/python scenarios/retail/retail.py

bench: $(STAMP)
	$(BIN)/padres bench parse

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache .hypothesis
