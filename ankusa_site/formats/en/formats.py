"""One way to write a time across the console: ``2026-12-01 13:28:01 UTC`` (ISO order, to the second,
the zone named), for the admin's lists and pages alike (``FORMAT_MODULE_PATH`` in the settings)."""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s T"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s"
