"""Schemathesis over a broker's OpenAPI schema: whatever it sends, no answer is a 5xx.

Each operation gets valid and invalid requests that Schemathesis generates from the schema
(``EXAMPLES`` each), sent to a real broker process."""

from __future__ import annotations

from typing import Any, Final

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok

from padres.testing.processes import BrokerProcess

EXAMPLES: Final = 10


def test_no_request_makes_the_api_fail() -> None:
    broker = BrokerProcess("S")
    broker.start()
    try:
        schema = schemathesis.openapi.from_url(f"http://127.0.0.1:{broker.port}/openapi.json")
        operations = []
        for result in schema.get_all_operations():
            assert isinstance(result, Ok), result.err()
            operations.append(result.ok())
        assert len(operations) > 15  # every REST endpoint is described

        for operation in operations:

            @given(case=operation.as_strategy())
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def no_server_error(case: schemathesis.Case[Any]) -> None:
                case.call_and_validate(checks=[not_a_server_error], timeout=15)

            no_server_error()
    finally:
        broker.stop()
