"""The record format and its storage: one JSON file per machine and ISA setting.

:mod:`~convlab.lab.record.record_schema` (the record and manifest schema),
:mod:`~convlab.lab.record.records` (reading records and manifests),
:mod:`~convlab.lab.record.runner` (``make records``, which writes them, one fresh process
per ISA setting), :mod:`~convlab.lab.record.record_pages` (which records a chapter shows),
:mod:`~convlab.lab.record.record_sentences` (sentences computed from records) and
:mod:`~convlab.lab.record.version_runs` (the chapters' runs on other torch versions). The
sections a record holds are in :mod:`convlab.lab.sections`.
"""
