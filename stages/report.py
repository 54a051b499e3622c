"""DVC stage `report`: reports/index.html and reports/tables/ (CSV, Markdown) from params, metrics, logs,
samples and the paper's numbers."""
from vcarepro.report.render import render_report

if __name__ == "__main__":
    print(f"report: {render_report('.', 'reports/index.html')}")
