"""Pages kept outside docs/ that the site shows as they are: RELIABILITY.md and BENCHMARKS.md stay at
the repository's root (where they are written and linked from), the chart's CHANGELOG.md and README.md
stay in the chart (helm package ships them)."""
import os

from mkdocs.structure.files import File

PAGES = {
    "evidence/reliability.md": "RELIABILITY.md",
    "evidence/benchmarks.md": "BENCHMARKS.md",
    "reference/chart-changelog.md": "deploy/helm/raysync/CHANGELOG.md",
}


def on_files(files, config):
    root = os.path.dirname(config["config_file_path"])
    for uri, path in PAGES.items():
        files.append(File.generated(config, uri, abs_src_path=os.path.join(root, path)))
    return files
