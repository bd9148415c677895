"""The watch settings reach each stream's configuration (docs/watchers.md, the table of settings)."""

from fleet.kube.streams import stream_config


def test_the_batch_window_setting_is_each_streams_flush_interval(settings):
    settings.CLAIMSCOPE_WATCH_FLUSH_MS = 80
    assert stream_config().flush_interval == 0.08
    settings.CLAIMSCOPE_WATCH_FLUSH_MS = 250
    assert stream_config().flush_interval == 0.25
