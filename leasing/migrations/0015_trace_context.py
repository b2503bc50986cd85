"""Tracing: `trace_context`, the enqueuer's W3C trace context (leasing.tracing).

A nullable column without a default: PostgreSQL adds it without rewriting the
table or scanning it.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("leasing", "0014_worker_runs"),
    ]

    operations = [
        migrations.AddField(
            model_name="workitem",
            name="trace_context",
            field=models.JSONField(
                blank=True,
                editable=False,
                help_text="The enqueuer's W3C trace context, when tracing was on.",
                null=True,
            ),
        ),
    ]
