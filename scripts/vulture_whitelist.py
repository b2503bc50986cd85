"""Names in leasing/ that `make deadcode` (vulture) must count as used: what Django,
Python, the templates or the app's users call by name, never the app's own code.

vulture matches names, not objects: `_.name` below marks every attribute, method or
variable called `name` as used. Each entry says who calls it; a name only the test
suite uses does not belong here (it is dead code, or a public name users call).
"""

# ruff: noqa: B018

_ = object()

# --- Python ----------------------------------------------------------------------------------
_.__getattr__  # leasing/__init__.py: PEP 562, `from leasing import enqueue`
_.__dir__  # leasing/__init__.py: PEP 562, dir(leasing)
_.__class__  # management/base.py: the parser's class is swapped after Django builds it

# --- Django: apps, checks, signals, settings, URLs -------------------------------------------
_.LeasingConfig  # apps.py: INSTALLED_APPS
_.default_auto_field
_.ready  # AppConfig.ready
_.check_settings  # checks.py: @checks.register, run by `manage.py check`
_.check_time_zone
_.check_schedules
_.check_database
_.check_autocommit
_.app_configs  # the keyword Django passes every check function
_._reload_on_change  # conf.py: @receiver(setting_changed)
_._tracing_changed  # tracing.py: @receiver(setting_changed)
_.app_name  # urls.py: the URL namespace
_.urlpatterns

# --- Django: management commands and migrations ----------------------------------------------
_.Command  # management/commands/*.py: found by module name
_.help
_.add_arguments
_.handle
_.requires_system_checks
_.database_forwards  # migrations: RunSQL-like operations Django runs
_.database_backwards

# --- Django: models --------------------------------------------------------------------------
_.Meta
_.ordering
_.constraints
_.indexes
_.get_latest_by
_.permissions
_.limit_count  # RateBucket columns, written and read by leasing.sql.rates
_.period_seconds
_.Type  # TextChoices of a model: Django builds `choices` and forms from them
_.Status
_.Role
_.Missed
_.CATCH_UP
# Columns the app reads and writes in SQL (leasing/sql, leasing/storage), not by attribute.
_.stopped_at
_.lease_deadline_at
_.updated_at
_.unique_until
_.response_data
_.last_tick_at
_.last_run_at
_.dependency
_.dependent

# --- Django: the admin -----------------------------------------------------------------------
_.current_app  # request.current_app: the admin site's namespace for reverse()
_.show_full_result_count  # ModelAdmin options
_.show_facets
_.Media
_.has_add_permission
_.has_change_permission
_.has_control_permission  # admin.action(permissions=["control"]) calls it
_.get_changelist
_.waits_for  # admin/options.py: the fields of the item page's Dependencies fieldset
_.waited_for_by
_.get_fieldsets
_.list_display
_.list_filter
_.search_fields
_.search_help_text
_.sortable_by
_.list_per_page
_.list_max_show_all
_.save_model
_.save_related
_.delete_model
_.delete_queryset
_.parameter_name  # SimpleListFilter
_.field_classes  # ModelForm.Meta
_.clean_name  # form field cleaning: clean_<field>
_.clean_work_type
_.clean_queue_name
_.clean_cron
_.clean_every
_.clean_timezone
_.clean_missed
_.clean_payload
_.action_checkbox  # list_display entries and admin actions, named as strings
_.lease_expires  # the admins' times to the second (display.time_column), named as strings
_.expires
_.last_scan
_.next_run  # the Schedules admin's list and change page, named as strings
_.last_tick
_.last_run
_.last_failure
_._mutable  # QueryDict: made read-only again after the list drops a bad filter value
_.task_link
_.status_badge
_.type_badge
_.last_seen
_.held_items
_.last_item
_.input_payload
_.output_payload
_.snapshot_payload
_.metadata_payload
_.response_payload
_.enable_selected
_.disable_selected

# --- Django: templates (leasing/templates) and template tags ---------------------------------
_.percent  # templatetags/leasing_console.py: @register
_.leasing_liveness
_.leasing_lease_links
_.leasing_worker_row
_.leasing_tools_in_content
_.leasing_nonce_attr
_.leasing_date_hierarchy  # admin/leasing/change_list.html
_.hidden_fields_for_items  # admin/leasing/confirm.html
_.not_claiming_ids  # admin/leasing/dashboard/queues.html: who takes a pair but claims nothing
_.help_text
_.is_capped
_.bucket_minutes  # the console's pages: chart geometry and figures
_.completed_per_minute
_.failed_x
_.text_x
_.caption
_.width
_.height
_.show_label
_.completed_y
_.completed_height
_.failed_y
_.failed_height
_.plot_left
_.label_y
_.colour
_.dots
_.rolled_from
_.last_error
_.earlier_attempts_hidden
_.first_at
_.average_lease_seconds
_.expirations_per_hour
_.expiration_rate
_.renewal_rate
_.stuck
_.expired_lease_count
_.oldest_pending_age_seconds
_.queue_limit
_.queue_in_flight
_.type_limit
_.type_in_flight
_.failure_rate
_.type_label
_.status_label

# --- Django's Tasks framework and prometheus_client ------------------------------------------
_.supports_defer  # tasks/backend.py: what LeasingBackend declares to django.tasks
_.supports_async_task
_.supports_get_result
_.supports_priority
_.collect  # metrics.py: the collector protocol /metrics calls

# --- The public API: what users call (leasing.__all__, the spec) -----------------------------
_.start_heartbeat  # leasing.start_heartbeat
_.dependents_of  # leasing.dependents_of
_.acquire_lease  # LeaseManager
_.release_lease
_.renew_leases
_.requeue_lease
_.held_leases
_.lease_for
_.get_statistics  # RecoverySweep
_.lease_lost_reason  # WorkContext, in handlers
_.wait_lease_lost
_.assertEnqueued  # leasing.testing, in users' tests
_.assertNotEnqueued
_.handed_back
_.renew_lease  # LeaseManager.renew_lease (the spec's API; the keepers renew in batches)
_.extensions  # LeaseExtender.extensions: how many extensions it made
_.on_failure  # leasing.waiting_on(...).on_failure
_.RESTING  # leasing.transitions: the statuses a row may rest in (the tests' database guard)
_.with_lease_health  # WorkItem.objects: users' own reports (one global STALE_HEARTBEAT)
_.without_progress
_.LISTENING  # sql/wakes.py: matches listener sessions in pg_stat_activity (monitoring, bench)

# --- The console's read models: facts a read computed, which the tests check ---------------
_.oldest_created_at  # console/backlog.py
_.rolled_through  # console/finished.py
_.threshold_seconds  # console/processes.py
_.runs_idle  # console/processes.py: the dashboard's worker rows (a template reads it)
_.runs_abandoned_total  # models/processes.py: a column the beat adds to, /metrics sums
_.payload_included  # console/timeline.py
_.opens_in_seconds  # console/rates.py: the dashboard's rate limits panel
_.waiting_capped  # console/rates.py: the rate limits panel ("1,000+")
_.WAIT  # leasing.states: values users pass (on_dependency_failure, checkpoint types)
_.ITERATION_START
_.TOOL_EXECUTED
_.LLM_RESPONSE
_.APPROVAL_POINT
_.MANUAL_CHECKPOINT

# --- The repository's own tools --------------------------------------------------------------
_.feature  # transitions.py: the state-machine page (docs/hooks/docgen/machine.py)
