"""One interceptor per framework: each has install() and uninstall() and feeds the recorder."""
