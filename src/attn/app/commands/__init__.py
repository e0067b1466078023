"""The commands of `attn`, each as its parser (`add_<name>_parser`) beside the function that runs it (`cmd_<name>`).

`flags` holds the flags several commands share, `io` how they read inputs and write outputs."""
