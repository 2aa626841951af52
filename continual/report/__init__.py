"""Reports of experiments run by the launcher (`python -m continual.report KIND FOLDER --out DIR`): each reads an
experiment folder's runs and writes report.md, report.json and its figures."""
