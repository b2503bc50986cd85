"""Unique enqueue and dependencies between work items.

* `work_items.unique_key`, `unique_scope`, `unique_until`: an item holds its
  key while pending, while pending or in progress, or until `unique_until`;
  `work_items_unique_key_uniq` is the partial unique index that enqueue's
  INSERT ... ON CONFLICT names for the two status scopes, and
  `work_items_unique_period_idx` finds the holders of a period-scoped key.
* `work_items.dependencies_left`, `has_dependents`, `on_dependency_failure`
  and the `work_item_dependencies` table (one row per edge): an item is
  claimable only when `dependencies_left` is 0. The claim index gets that
  condition, so blocked items never enter it; `work_items_blocked_idx` holds
  them instead.
"""

import django.db.models.deletion
import django.db.models.functions.comparison
import django.db.models.functions.text
import django.db.models.lookups
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('leasing', '0006_console_indexes'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='workitem',
            name='work_items_claim_idx',
        ),
        migrations.AddField(
            model_name='workitem',
            name='dependencies_left',
            field=models.IntegerField(db_default=0, default=0, help_text='Dependencies not completed yet; claimable only at 0.'),
        ),
        migrations.AddField(
            model_name='workitem',
            name='has_dependents',
            field=models.BooleanField(db_default=False, default=False, help_text='Some item depends on this one (its completion or failure must reach them).'),
        ),
        migrations.AddField(
            model_name='workitem',
            name='on_dependency_failure',
            field=models.TextField(blank=True, choices=[('fail', 'Fail with the dependency'), ('wait', 'Stay blocked')], null=True),
        ),
        migrations.AddField(
            model_name='workitem',
            name='unique_key',
            field=models.TextField(blank=True, help_text='Enqueue returns the holder of this key instead.', null=True),
        ),
        migrations.AddField(
            model_name='workitem',
            name='unique_scope',
            field=models.TextField(blank=True, choices=[('pending', 'While pending'), ('unfinished', 'While pending or in progress'), ('period', 'For a period after enqueue')], null=True),
        ),
        migrations.AddField(
            model_name='workitem',
            name='unique_until',
            field=models.DateTimeField(blank=True, help_text="The end of the key's period (period scope only).", null=True),
        ),
        migrations.AddIndex(
            model_name='workitem',
            index=models.Index(models.OrderBy(models.F('priority'), descending=True), django.db.models.functions.comparison.Coalesce('run_after', 'created_at'), models.F('created_at'), models.F('work_item_id'), models.F('run_after'), condition=models.Q(('dependencies_left', 0), ('status', 'pending')), name='work_items_claim_idx'),
        ),
        migrations.AddIndex(
            model_name='workitem',
            index=models.Index(condition=models.Q(('dependencies_left__gt', 0), ('status', 'pending')), fields=['created_at'], name='work_items_blocked_idx'),
        ),
        migrations.AddIndex(
            model_name='workitem',
            index=models.Index(condition=models.Q(('unique_scope', 'period')), fields=['unique_key', 'unique_until'], name='work_items_unique_period_idx'),
        ),
        migrations.AddConstraint(
            model_name='workitem',
            constraint=models.CheckConstraint(condition=django.db.models.lookups.LessThanOrEqual(django.db.models.functions.text.Length('unique_key'), 255), name='work_items_unique_key_length'),
        ),
        migrations.AddConstraint(
            model_name='workitem',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('unique_key__isnull', True), ('unique_scope__isnull', True), ('unique_until__isnull', True)), models.Q(('unique_key__isnull', False), ('unique_scope__in', ['pending', 'unfinished']), ('unique_until__isnull', True)), models.Q(('unique_key__isnull', False), ('unique_scope', 'period'), ('unique_until__isnull', False)), _connector='OR'), name='work_items_unique_scope_valid'),
        ),
        migrations.AddConstraint(
            model_name='workitem',
            constraint=models.UniqueConstraint(condition=models.Q(models.Q(('unique_scope', 'pending'), ('status', 'pending')), models.Q(('unique_scope', 'unfinished'), ('status__in', ['pending', 'in_progress'])), _connector='OR'), fields=('unique_key', 'unique_scope'), name='work_items_unique_key_uniq'),
        ),
        migrations.AddConstraint(
            model_name='workitem',
            constraint=models.CheckConstraint(condition=models.Q(('dependencies_left__gte', 0)), name='work_items_dependencies_left_non_negative'),
        ),
        migrations.AddConstraint(
            model_name='workitem',
            constraint=models.CheckConstraint(condition=models.Q(('on_dependency_failure__isnull', True), ('on_dependency_failure__in', ['fail', 'wait']), _connector='OR'), name='work_items_on_dependency_failure_valid'),
        ),
        migrations.CreateModel(
            name='WorkItemDependency',
            fields=[
                ('pk', models.CompositePrimaryKey('dependency', 'dependent', blank=True, editable=False, primary_key=True, serialize=False)),
                ('dependency', models.ForeignKey(db_column='dependency_id', db_index=False, on_delete=getattr(django.db.models.deletion, 'DB_CASCADE', django.db.models.deletion.CASCADE), related_name='dependent_links', to='leasing.workitem')),
                ('dependent', models.ForeignKey(db_column='dependent_id', db_index=False, on_delete=getattr(django.db.models.deletion, 'DB_CASCADE', django.db.models.deletion.CASCADE), related_name='dependency_links', to='leasing.workitem')),
            ],
            options={
                'db_table': 'work_item_dependencies',
            },
        ),
        migrations.AddIndex(
            model_name='workitemdependency',
            index=models.Index(fields=['dependent'], name='work_item_deps_dependent_idx'),
        ),
    ]
