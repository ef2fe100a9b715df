from servetune.cli import app

app()
