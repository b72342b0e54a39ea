"""CloudWatch embedded metric format lines (pure)."""

import io
import json

from chalicelib.clock import ManualClock
from chalicelib.observability.emf import EmfWriter, emf_document


def test_a_document_declares_its_metrics_and_carries_their_values():
    doc = emf_document("KVCM/dev", {"Job": "reclaim"}, {"JobSuccesses": 1}, 1_700_000_000_000)
    assert doc == {
        "_aws": {
            "Timestamp": 1_700_000_000_000,
            "CloudWatchMetrics": [
                {
                    "Namespace": "KVCM/dev",
                    "Dimensions": [["Job"]],
                    "Metrics": [{"Name": "JobSuccesses", "Unit": "Count"}],
                }
            ],
        },
        "Job": "reclaim",
        "JobSuccesses": 1,
    }


def test_a_writer_prints_one_line_per_emit_and_nothing_without_a_namespace():
    out = io.StringIO()
    EmfWriter("KVCM/dev", ManualClock(1_700_000_000.5), out).emit({"Job": "x"}, {"JobFailures": 1})
    (line,) = out.getvalue().splitlines()
    assert json.loads(line)["_aws"]["Timestamp"] == 1_700_000_000_500
    silent = io.StringIO()
    EmfWriter("", ManualClock(), silent).emit({"Job": "x"}, {"JobFailures": 1})
    assert silent.getvalue() == ""
