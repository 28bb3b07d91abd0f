"""The HTTP layer: the app, its routes, middleware, views, schemas and the OpenAPI document."""
