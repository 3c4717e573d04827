"""REST endpoints of the queues, for staff only: ``queues.view_queueitem`` to read,
``queues.change_queueitem`` to requeue, ``queues.delete_queueitem`` to remove (tenant tokens: 403).

* ``GET /api/v1/queues/``: lengths and oldest ages of every queue of both backends.
* ``GET /api/v1/queues/{name}/``: the same for one queue (its configured backend, or
  ``?backend=database|redis``).
* ``POST /api/v1/queues/{name}/requeue-failed/`` ``{"max_fail_count": n, "delay_s": s}`` (both
  optional): failed items back to the tail of the queue; answers ``{"requeued": n}``.
* ``POST /api/v1/queues/{name}/remove-failed/`` ``{"older_than_s": s}`` (optional): answers
  ``{"removed": n}``.

Each view validates its input and calls one method of the queue. Every error is JSON
``{"error": code, "detail": text}``; a backend that does not answer is a 503.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import DatabaseError
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from redis.exceptions import RedisError
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from ankusa_site.core import arguments
from ankusa_site.core.api import Access, StrictSerializer, errors, refuse_unknown_query_params
from queues.actions import overview
from queues.backends import get_queue
from queues.fifo import NAME_PATTERN, ReliableFIFO

# The bodies are two small numbers; anything much bigger is not one of them.
MAX_BODY_BYTES = 4096
MAX_SECONDS = arguments.MAX_SECONDS  # as the queues command takes them
# A fail count is a 32-bit integer column.
MAX_FAIL_COUNT = 2**31 - 1


class BackendUnavailable(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "backend_unavailable"


class QueueView(Access, APIView):
    permission_model = "queues.queueitem"

    def handle_exception(self, exc):
        if isinstance(exc, RedisError | DatabaseError):
            exc = BackendUnavailable(f"The queue backend did not answer: {type(exc).__name__}.")
        return super().handle_exception(exc)

    def queue(self, request, name: str) -> ReliableFIFO:
        backend = request.query_params.get("backend")
        if not NAME_PATTERN.match(name):
            raise exceptions.ValidationError({"name": ["Use 1 to 64 letters, digits, '_', '.' or '-'."]})
        if backend not in (None, "database", "redis"):
            raise exceptions.ValidationError({"backend": ["Use 'database' or 'redis'."]})
        return get_queue(name, backend=backend)

    def body(self, request, serializer_class) -> dict:
        if _content_length(request) > MAX_BODY_BYTES:
            raise exceptions.ValidationError({"body": [f"At most {MAX_BODY_BYTES} bytes."]})
        data = request.data
        if not isinstance(data, dict):
            raise exceptions.ValidationError({"body": ["Send a JSON object."]})
        serializer = serializer_class(data=data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data


def _content_length(request) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0  # Django reads no body it cannot measure


def seconds(required: bool = False):
    return serializers.FloatField(required=required, min_value=0, max_value=MAX_SECONDS, allow_null=True)


class RequeueFailedInput(StrictSerializer):
    max_fail_count = serializers.IntegerField(
        required=False, min_value=0, max_value=MAX_FAIL_COUNT, allow_null=True
    )
    delay_s = seconds()


class RemoveFailedInput(StrictSerializer):
    older_than_s = seconds()


def duration(value: float | None) -> timedelta | None:
    return None if value is None else timedelta(seconds=value)


SUB_QUEUE_FIELDS = {"length": serializers.IntegerField(), "age_s": serializers.FloatField(allow_null=True)}
SUB_QUEUE = inline_serializer("SubQueue", SUB_QUEUE_FIELDS)
# An overview row of a backend that failed has an error instead of the lengths.
OPTIONAL_SUB_QUEUE = inline_serializer("OptionalSubQueue", SUB_QUEUE_FIELDS, required=False)

QUEUE_STATS = inline_serializer(
    "QueueStats",
    {
        "name": serializers.CharField(),
        "backend": serializers.ChoiceField(choices=["database", "redis"]),
        "main": SUB_QUEUE,
        "busy": SUB_QUEUE,
        "failed": SUB_QUEUE,
    },
)
OVERVIEW_ROW = (
    "QueueOverviewRow",
    {
        "name": serializers.CharField(),
        "backend": serializers.ChoiceField(choices=["database", "redis"]),
        "main": OPTIONAL_SUB_QUEUE,
        "busy": OPTIONAL_SUB_QUEUE,
        "failed": OPTIONAL_SUB_QUEUE,
        "error": serializers.CharField(required=False, help_text="Set instead of the lengths when the "
                                       "backend failed."),
    },
)  # fmt: skip
OVERVIEW = inline_serializer(
    "QueueOverview",
    {
        "queues": inline_serializer(*OVERVIEW_ROW, many=True),
        "problems": serializers.ListField(child=serializers.CharField()),
    },
)
BACKEND = OpenApiParameter("backend", enum=["database", "redis"], required=False)


class QueueList(QueueView):
    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        refuse_unknown_query_params(request, set())  # a list, as every other: it takes none

    @extend_schema(operation_id="queues_list", responses={200: OVERVIEW, **errors(401, 403, 503)})
    def get(self, request):
        return Response(overview())


class QueueDetail(QueueView):
    @extend_schema(parameters=[BACKEND], responses={200: QUEUE_STATS, **errors(400, 401, 403, 503)})
    def get(self, request, name: str):
        return Response(self.queue(request, name).stats())


class RequeueFailed(QueueView):
    action_permissions = {"post": ("queues.change_queueitem",)}

    @extend_schema(
        parameters=[BACKEND],
        request=RequeueFailedInput,
        responses={
            200: inline_serializer(
                "Requeued",
                {"queue": serializers.CharField(), "backend": serializers.CharField(),
                 "requeued": serializers.IntegerField()},
            ),
            **errors(400, 401, 403, 503),
        },
    )  # fmt: skip
    def post(self, request, name: str):
        queue = self.queue(request, name)
        data = self.body(request, RequeueFailedInput)
        moved = queue.requeue_failed(data.get("max_fail_count"), duration(data.get("delay_s")))
        return Response({"queue": queue.name, "backend": queue.backend, "requeued": moved})


class RemoveFailed(QueueView):
    action_permissions = {"post": ("queues.delete_queueitem",)}

    @extend_schema(
        parameters=[BACKEND],
        request=RemoveFailedInput,
        responses={
            200: inline_serializer(
                "Removed",
                {"queue": serializers.CharField(), "backend": serializers.CharField(),
                 "removed": serializers.IntegerField()},
            ),
            **errors(400, 401, 403, 503),
        },
    )  # fmt: skip
    def post(self, request, name: str):
        queue = self.queue(request, name)
        data = self.body(request, RemoveFailedInput)
        removed = queue.remove_failed(duration(data.get("older_than_s")))
        return Response({"queue": queue.name, "backend": queue.backend, "removed": removed})
