"""What a newcomer types first, per `hyperqwen` command: the no-traceback tests run each of them."""

# A typical first try of each command (bad input included), as a newcomer types it; the URLs lead nowhere.
TYPICAL = {
    "serve": ["serve", "--print", "--set", "SPEC=eagle"],
    "plan": ["plan", "--gpu", "rtx9999"],
    "calibrate": ["calibrate", "--mode", "single"],
    "prepare": ["prepare"],
    "draft-vocab-recount": ["draft-vocab-recount", "--url", "http://127.0.0.1:9", "--out", "ids.json"],
    "verify": ["verify", "--server", "http://127.0.0.1:9"],
    "bench": ["bench", "chat", "--url", "http://127.0.0.1:9"],
    "monitor": ["monitor", "--upstream", "http://127.0.0.1:9"],  # imports aiohttp: the reported traceback
    "patches": ["patches", "check", "--target", "/nonexistent"],
    "replicas": ["replicas", "--print", "--no-device-check", "--set", "TP=3"],
    "router": ["router"],
    "knobs": ["knobs", "--check"],
}
