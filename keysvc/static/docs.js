// Renders keysvc's own OpenAPI document; every asset is served by keysvc itself.
window.onload = function () {
  window.ui = SwaggerUIBundle({
    url: "v1/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
  });
};
