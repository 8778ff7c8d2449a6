"""Built-in target plugins, one folder each, registered through the ``hwbackends`` entry-point
group exactly as a third-party plugin would be (installed as the ``hwb_plugins`` package)."""
