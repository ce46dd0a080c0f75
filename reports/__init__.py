"""HTML reports: one self-contained file per results document (no network, no CDN).

``load_results`` reads and checks a results JSON file, ``render_report`` turns the document into
HTML, ``write_report`` writes it atomically.
"""

from quantbench.reports.render import render_report, write_report
from quantbench.reports.results import SCHEMA, SCHEMA_VERSION, load_results, validate_results

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "load_results",
    "render_report",
    "validate_results",
    "write_report",
]
