from django.apps import AppConfig


class CommandsConfig(AppConfig):
    name = "commands"
    verbose_name = "Commands"
