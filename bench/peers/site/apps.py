from django.apps import AppConfig


class PeersSiteConfig(AppConfig):
    name = "bench.peers.site"
    label = "bench_peers"
