"""The API's route groups beyond the jobs (app.py): each module's `routes(...)` returns
its Starlette routes. The guard (guard.py) stands in front of all of them; the handlers
here check only what a request asks for."""
