"""Helpers several built-in plugins share (ONNX batch fixing, Keras → TFLite conversion, the
LiteRT executor). Plugins import these; no plugin imports another plugin. A third-party plugin
would copy what it needs instead: this package is not part of the plugin contract."""
