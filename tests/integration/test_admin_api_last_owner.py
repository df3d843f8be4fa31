"""The organization always keeps an active owner: demoting or deleting the last one is a 400.

Seen live: two owners demoting each other at the same moment both answered 200, leaving no active
staff user, so every admin key was a 401 and the organization was locked out of this API.  Each
request authenticated while its own owner was still staff; the tests below replay that interleaving
deterministically: the caller's owner is demoted (the other request committing) right after the
caller's key is accepted.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from organization.authentication import AdminKeyAuthentication
from organization.members import LastOwnerError, change_member
from tests.admin_api import delete, post
from tests.conftest import issue_admin_key

pytestmark = pytest.mark.django_db

User = get_user_model()


@pytest.fixture
def second_owner(db):
    """Olga, the organization's other owner, with her own admin key."""
    olga = User.objects.create_user(username="olga", email="olga@example.org", is_staff=True)
    return olga, issue_admin_key(olga, "olga's key")


@pytest.fixture
def demoted_while_calling(monkeypatch):
    """Demote the caller's owner just after their key is accepted: the other owner's request landing first."""

    def arrange(owner):
        accept = AdminKeyAuthentication.authenticate

        def accept_then_lose_staff(self, request):
            accepted = accept(self, request)
            User.objects.filter(pk=owner.pk).update(is_staff=False)
            return accepted

        monkeypatch.setattr(AdminKeyAuthentication, "authenticate", accept_then_lose_staff)

    return arrange


def test_demoting_the_last_active_owner_is_a_400_naming_role(staff_user, second_owner, demoted_while_calling):
    olga, olga_key = second_owner
    demoted_while_calling(olga)

    answer = post(f"/users/user_{staff_user.pk}", olga_key.plaintext, {"role": "reader"})

    assert answer.status == 400
    assert (answer.error["param"], answer.error["code"]) == ("role", "invalid_value")
    assert "last active owner" in answer.error["message"]
    staff_user.refresh_from_db()
    assert staff_user.is_staff and staff_user.is_active


def test_deleting_the_last_active_owner_is_a_400(staff_user, second_owner, demoted_while_calling):
    olga, olga_key = second_owner
    demoted_while_calling(olga)

    answer = delete(f"/users/user_{staff_user.pk}", olga_key.plaintext)

    assert answer.status == 400 and "last active owner" in answer.error["message"]
    staff_user.refresh_from_db()
    assert staff_user.is_staff and staff_user.is_active


def test_an_owner_may_demote_another_while_one_remains(staff_user, second_owner):
    olga, olga_key = second_owner

    assert post(f"/users/user_{staff_user.pk}", olga_key.plaintext, {"role": "reader"}).status == 200
    staff_user.refresh_from_db()
    assert not staff_user.is_staff


def test_the_rule_holds_outside_the_api_too(staff_user, user):
    with pytest.raises(LastOwnerError):
        change_member(staff_user, is_staff=False)
    with pytest.raises(LastOwnerError):
        change_member(staff_user, is_active=False)
    change_member(user, is_active=False)  # a reader is never the last owner

    staff_user.refresh_from_db()
    assert staff_user.is_staff and staff_user.is_active
