"""The gateway's HTTP routes, one router per resource; `gateway.app.create_app` includes them all."""
