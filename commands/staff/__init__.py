"""Staff: what people use to watch and act on commands.

* ``actions`` — approve, resend, cancel, new command: the guards, the dry run, the compare-and-set
  and the audit row, for the admin and the REST API alike; ``explain`` says why a command waits.
  ``connector_tools`` — a connector's signing secrets (add, drop) and its test send, likewise.
* Admin (registered by ``commands.admin``): ``admin_connectors`` (connectors, sources),
  ``admin_commands`` (the command and failed lists), ``command_page`` (a command's page),
  ``admin_history`` (audit, attempts, deliveries), with ``admin_actions``, ``admin_lists``,
  ``connector_glance``, ``search`` and ``admin_connector_tools`` (the connector page's tools); ``dashboard`` and ``staff_groups``.
* REST API (``api_urls``, under ``/api/v1/``): ``api_base`` (the tenant-scoping bases),
  ``api_connectors`` (+ ``api_connector_tools``), ``api_commands`` (+ ``api_command_io``), ``api_history``.
"""
