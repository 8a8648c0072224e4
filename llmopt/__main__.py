from llmopt.cli.main import entry

entry()
