"""DVC stage `report`: reports/index.html and reports/tables/ (CSV, Markdown) from params, metrics, logs,
samples and the paper's numbers."""

from vcarepro.core.stage import run_stage
from vcarepro.report.render import render_report


def main() -> None:
    print(f"report: {render_report('.', 'reports/index.html')}")


if __name__ == "__main__":
    run_stage(main, stage_table=True)
